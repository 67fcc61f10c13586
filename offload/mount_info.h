// Which file system holds a path, from /proc/self/mountinfo: for messages that must name it
// (NvmeStore's warning about a file system without fallocate).
//
// Thread safety: the functions keep no state; any thread may call them at any time.
#pragma once

#include <string>

namespace zinf::offload {

// Undoes the octal escapes of a /proc/self/mountinfo field (\040 for a space, \011 for a tab,
// \012 for a newline, \134 for a backslash): a backslash and three octal digits become that
// byte; anything else, an incomplete escape included, is kept as it is.
[[nodiscard]] std::string unescape_mount_field(const std::string& field);

// "ext4 at /mnt/nvme": the type and mount point of the file system holding `path` (resolved
// through realpath when it exists), from /proc/self/mountinfo, where the longest mount point
// containing it wins. When that file cannot be read: "file system type 0x..." (the statfs
// magic number of `fd`, an open descriptor on that file system), else "unknown file system".
// Never throws for a missing path or file.
[[nodiscard]] std::string describe_filesystem(const std::string& path, int fd);

}  // namespace zinf::offload
