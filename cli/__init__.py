"""The command line: the `onelane` command (cli/main.py) and the terminal client.

The top of the house: the only package that imports tasks/, web/ and worker/ (the last two only inside the commands
that start them), and one that nothing imports, so the contract in tasks/ holds only the contract.
"""
