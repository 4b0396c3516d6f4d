"""Entry point of alchemi-properties. Its properties are Python calls (``equation_of_state``,
``elastic_tensor``, ``phonons``, ``rdf``, ...), not components of a kind, so it registers none;
the entry point makes ``alchemi list-plugins`` show it installed and loading."""
