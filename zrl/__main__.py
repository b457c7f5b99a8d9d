from zrl.cli import main

main()
