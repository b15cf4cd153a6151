"""`python -m deployer.cli`: the same as the `deploy` command."""

from deployer.cli.main import main

main()
