"""CAPE (NeurIPS 2025, arXiv 2509.16629), built on the suite's tasks: step 1 structure learning
(``cape.structure``), step 2 the hyperbolic embedding (``cape.embedding``), step 3 rotary attention
(``cape.attention``), and the downstream masked-feature task (``cape.downstream``)."""
