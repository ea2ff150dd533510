"""This machine: starting and stopping processes and local daemons (gearmand, stunnel), loopback
ports, the host's fingerprint and load, the host-wide benchmark lock, what targets it can serve
(probe), and connections to the farm's job servers."""
