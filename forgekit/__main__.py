from forgekit.cli import main

main()
