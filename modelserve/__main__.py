from modelserve.cli import main

raise SystemExit(main())
