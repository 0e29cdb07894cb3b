"""engine=verl: verl worker groups (Ray, FSDP2) per policy; the CPU platform plugin for verl."""
