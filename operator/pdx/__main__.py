from pdx.cli import main

main()
