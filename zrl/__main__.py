"""`python -m zrl`: the `zrl` command. `zrl run`'s children run it too, exec'd or forked
(zrl.launch.processes runs this module in the forked child)."""
from zrl.cli import main

main()
