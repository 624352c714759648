from theinference.cli import main

main()
