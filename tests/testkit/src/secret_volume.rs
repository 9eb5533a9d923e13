//! Writing a directory the way the kubelet writes a Secret volume, so that readers of one (the
//! router's key directory) are tested against the real layout and its atomic update.

use std::path::Path;

/// Writes `data` into `dir` as generation `generation` of a Secret volume: the files in a new
/// `..<generation>` folder, the `..data` link swapped to it with one rename, one link per data
/// key through `..data`, and the links of keys no longer present removed. Panics on I/O errors
/// (test support).
pub fn write(dir: &Path, generation: u32, data: &[(&str, &[u8])]) {
    let folder = dir.join(format!("..gen{generation}"));
    std::fs::create_dir_all(&folder).expect("create the generation folder");
    for (name, value) in data {
        std::fs::write(folder.join(name), value).expect("write a data key");
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&folder, &tmp).expect("link the new generation");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for entry in std::fs::read_dir(dir).expect("list the volume").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !data.iter().any(|(n, _)| *n == name) {
            std::fs::remove_file(entry.path()).expect("remove a gone key");
        }
    }
    for (name, _) in data {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link)
                .expect("link a data key");
        }
    }
}
