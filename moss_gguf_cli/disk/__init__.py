"""How bytes reach the disk: outputs staged under a hidden name and renamed when complete
(staging), O_DIRECT and write-behind writers (sinks), dropping source pages from the page
cache once read (page_cache), digests of files already hashed and checked (digests), and the
names of the folders and files moss-gguf writes (layout_names).

May import: the top level (errors, progress, report, hold_points) only (rank 1; native/ is beside
it, never imported).
"""
