"""Data sets in their official on-disk formats, and generators: one module per format, each
a function from files to a Dataset (fedray.data.dataset). ``loaders`` names them for a
recipe's ``source`` section; ``columns`` is what the bring-your-own-data sources (``numpy``,
``table``, ``hf_disk``) share.
"""
