# PyInstaller entry point of the runtime (frozen inside the builder container).
from sandbox_tools.runtime.cli import main

raise SystemExit(main())
