from sandbox_tools.runtime.cli import main

raise SystemExit(main())
