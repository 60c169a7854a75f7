"""Credit: how well each reward's per-turn credit matches what the turns were worth: credit accuracy and
its tables, reward ablation on saved episodes, the planted credit benchmark, the Monte-Carlo and exact
oracles, and external advantage code scored against them."""
