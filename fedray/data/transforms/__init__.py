"""Transforms of a client's data at run time, on top of any store: ``per_round`` re-draws or
corrupts a client's training data every round (``data.per_round``); ``per_client`` shifts a
client's inputs into a domain of its own (``data.per_client``). Both are pure functions of
the seed, the client id (and the round) and the client's stored data.
"""
