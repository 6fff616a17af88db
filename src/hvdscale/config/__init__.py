"""The study's config: reading it, the schema's defaults, the cross-key checks
(``load``). Pure Python; both environments import it."""
