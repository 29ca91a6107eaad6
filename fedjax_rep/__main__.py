from fedjax_rep.cli import command

command()
