"""The remote seam: the `Remote` protocol (`base`), over SSH (`ssh/`), on this machine (`local`) or scripted for
tests (`fake`); `connect` picks one for a target. Those are the transports; `conversation` puts the one target
client in front of any of them: the target-side helper, spoken to in typed requests over one exec channel (its
`helper` member: what only the helper answers). `program` builds the target-side programs from the supervisor
package, each loading what its entry modules import.

Library errors (paramiko, socket, subprocess) are translated into deployer.errors here and never cross the
seam. May import only the leaves (errors, the supervisor package's sources) and third-party libraries.
"""
