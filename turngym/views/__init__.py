"""Views: what a run wrote, shown to people: the eval report and run comparisons with plots, the episode
viewer (HTML), and the results logged to TensorBoard and W&B."""
