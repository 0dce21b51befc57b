"""``make bench-decimate``: our voxel backends against Open3D and PCL, side by side."""
