"""Modelled results: what a described cluster would measure, derived from measured rows (never
mixed with them: model tables carry `source = model`)."""
