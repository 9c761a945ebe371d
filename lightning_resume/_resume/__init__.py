"""What exact resume needs besides Lightning's own state: the restart rule, random states, the data
position of plain loaders, and the one touch of Lightning internals.
"""
