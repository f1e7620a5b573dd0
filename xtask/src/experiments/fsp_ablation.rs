use anyhow::Result; use super::Options; pub fn run(_o: &Options) -> Result<()> { anyhow::bail!("todo") }
