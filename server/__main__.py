from crashdrill.server.cli import main

raise SystemExit(main())
