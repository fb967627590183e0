"""What every layer checks a user's input with: the error it raises and the argparse types.

The bottom of the layers: every package may import it, and it imports none of them.
"""
