"""The supervisor's HTTP side: routes (``web``), the edge's counters and limits (``httpedge``), sockets
and accept loop (``listener``), and the web config file (``webconfig``, ``webmodel``, ``webtls``,
``webauth``). The only package besides ``exporter.cli`` that imports aiohttp. Nothing is imported here.
"""
