"""(in progress)"""

OPS: dict = {}
