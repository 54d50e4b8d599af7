"""``python3 -m e2e.mockhorovod ...`` runs the mock elastic driver (what ``horovodrun`` is)."""

from e2e.mockhorovod.driver import main

raise SystemExit(main())
