"""What runs inside the user's interpreter (the inner kernel), not in the agent: its entry
point (:mod:`.run`), ipykernel's and IPython's patches (:mod:`.patches`), the warm-ups
(:mod:`.warm`) and clone correctness (:mod:`.clone`)."""
