from softtokens.cli import main

raise SystemExit(main())
