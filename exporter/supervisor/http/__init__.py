"""The supervisor's HTTP side: routes (``web``), sockets and accept loop (``httpedge``), and the web
config file (``webconfig``, ``webmodel``, ``webtls``, ``webauth``). The only package besides ``exporter.cli`` that
imports aiohttp. Nothing is imported here.
"""
