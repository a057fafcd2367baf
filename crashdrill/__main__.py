from crashdrill.cli import main

raise SystemExit(main())
