from pyllama.cli import main

main()
