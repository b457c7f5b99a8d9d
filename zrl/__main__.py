"""`python -m zrl`: the `zrl` command. `zrl run`'s children run it too, exec'd or forked
(zrl.launch.processes runs this module in the forked child)."""
import os

if os.environ.get("ZRL_LINE_BUFFERED") == "1":  # (an exec'd child whose output zrl run relays: whole lines)
    from zrl.launch.processes import line_buffered_stdio

    line_buffered_stdio()

from zrl.cli import main  # noqa: E402

main()
