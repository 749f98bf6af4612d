"""The run folder, at the ground floor: what every entry is called (`folder.RunFolder`) and how a folder is written
whole or not at all (`atomic.replace_folder`). Imports only the standard library and `leap_finetune.errors`, so
every layer above may use it."""
