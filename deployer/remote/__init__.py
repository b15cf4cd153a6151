"""The remote seam: the `Remote` protocol (`base`), over SSH (`ssh/`) or on this machine (`local`).

Library errors (paramiko, socket, subprocess) are translated into deployer.errors here and never cross
the seam. May import only profile-free leaves (errors) and third-party libraries.
"""
