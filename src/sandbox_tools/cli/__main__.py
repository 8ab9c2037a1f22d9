from sandbox_tools.cli.app import main

main()
