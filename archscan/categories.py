"""The cost categories of a node (torch-free, so the report renderers can use them without torch).

Most specific first: a node made of several ops takes the first one it has
(``archscan.costs.category_of``).
"""

CATEGORIES = (
    "attention", "rnn", "conv", "grouped_conv", "depthwise_conv", "linear", "matmul", "embedding",
    "norm", "pooling", "activation", "elementwise", "reduction", "host_sync", "data_movement",
    "factory", "view", "other",
)
