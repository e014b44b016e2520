"""``schedlang tune``: the search over what a schedule can say (space.py), its pruned search (search.py) and
the file it writes (writing.py). docs/pipeline-tuning.md, "tune", states the space and the pruning."""
