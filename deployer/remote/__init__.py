"""The remote seam: the `Remote` protocol (`base`), over SSH (`ssh/`) or on this machine (`local`); `connect`
picks one for a target.

Library errors (paramiko, socket, subprocess) are translated into deployer.errors here and never cross the
seam. May import only the leaves (errors) and third-party libraries.
"""
