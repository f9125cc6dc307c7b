"""A stand-in for Cortex's serving package, so that ``from cortex_internal.lib.log import logger`` works.

modelserve appends this folder's parent to ``sys.path``; a real ``cortex_internal``, when installed, is found
first and used instead.
"""
