"""The FL methods' mathematics, apart from the machinery that runs rounds.

Pure functions and small records: FedDrop's keep-probability optimisation (`feddrop`),
FLuID's straggler sizing and invariant dropout (`fluid`), the coded computation of clients'
rows (`codes`), the learning-rate search (`lr_search`), aggregation of sub-models
(`aggregate`), sub-model extraction (`submodels`) and the server optimisers (`server_opt`).
Nothing here reaches a device, a store or a report.
"""
