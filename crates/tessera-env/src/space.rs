//! Room on the file systems that hold device files.
//!
//! Owns: asking the operating system how much a file system has free and
//! how much of a (sparse) device file is really allocated. Must not touch:
//! the devices' contents. Device files are made sparse, so a host's
//! devices take room only as they are written: these two figures say
//! whether the file system can hold them once they are full.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes an unprivileged writer may still allocate on the file system
/// holding `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let vfs = rustix::fs::statvfs(path).map_err(io::Error::from)?;
    Ok(vfs.f_bavail.saturating_mul(vfs.f_frsize))
}

/// Bytes of the file at `path` that the file system has allocated (less
/// than its size while it is sparse).
pub fn allocated_bytes(path: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(path)?.blocks().saturating_mul(512))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_sparse_file_takes_only_what_was_written_and_the_room_goes_down() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.img");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(1 << 30).unwrap();
        assert!(allocated_bytes(&path).unwrap() < 1 << 20);
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all(&vec![1u8; 4 << 20]).unwrap();
        file.sync_all().unwrap();
        let allocated = allocated_bytes(&path).unwrap();
        assert!(
            (4 << 20..(4 << 20) + (1 << 20)).contains(&allocated),
            "{allocated}"
        );
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("absent")).is_err());
    }
}
