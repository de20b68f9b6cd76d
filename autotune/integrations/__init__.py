"""Where winners go and come from: export / import / merge / prune, engine exporters."""
