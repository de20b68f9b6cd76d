"""The serving side: dispatch tables, prepacked weight layouts, FP4 layers. Never imports the engine."""
