"""The appliance image tools: ``image/build``, ``image/provision``, ``image/flash`` and
``image/qemu`` (thin shell wrappers around ``python3 -m edge_image.<tool>``).

Standard library only: the tools run as root with the host's Debian ``python3``, before
any virtualenv exists. Every tool reports bad input as one line on stderr and exit
status 2 (:class:`edge_image.common.BadInput`); a failing external command is exit 1.
"""
