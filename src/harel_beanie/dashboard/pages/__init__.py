"""The dashboard's handlers, one module per page with its JSON twin: plain functions taking
what they need through FastAPI dependencies (`harel_beanie.dashboard.context`). Where each is
served, and under which name, is declared in one place only: `harel_beanie.dashboard.routes`.
"""
