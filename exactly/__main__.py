from exactly.cli import main

raise SystemExit(main())
