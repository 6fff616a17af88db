"""The study's figures: the registry, the common style and one module per figure
family; they read the analysis tables (CSV) only."""
