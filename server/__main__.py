from crashdrill.server.serve_cli import main

raise SystemExit(main())
