"""`python -m gearfarm.cli`: the `gearfarm` command, as the farm starts its own processes."""

from gearfarm.cli.main import main

main()
