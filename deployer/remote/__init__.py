"""The remote seam: the `Remote` protocol (`base`), over SSH (`ssh/`) or on this machine (`local`); `connect`
picks one for a target. `conversation` puts one target-side helper process in front of either (one exec channel
for a whole command); `program` builds the target-side programs (the helper, the supervisor over stdin).

Library errors (paramiko, socket, subprocess) are translated into deployer.errors here and never cross the
seam. May import only the leaves (errors, the supervisor package's sources) and third-party libraries.
"""
