"""`SSHRemote`: the Remote protocol over one SSH connection per host (connection), its exec-channel plumbing
(channel) and what it needs before it dials (config: ~/.ssh/config, known_hosts).

May import remote.base and the leaves.
"""
