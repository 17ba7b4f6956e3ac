from condense.organism.train import main

main()
