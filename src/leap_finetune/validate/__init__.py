"""A config file checked against everything it names, before anything runs: `load_config` turns YAML into a
ResolvedConfig (profiles merged, paths absolute, every key and value checked) or one LeapError that says where and
how to fix it. Above config/ (the contract it fills in) and models/, data/, rl/ (whose knowledge it asks: which
model a name means, which chat template, which reward), below everything that runs a config.
"""
